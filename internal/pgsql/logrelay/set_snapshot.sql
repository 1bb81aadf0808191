-- The backfill reads the table as it stood when the slot was made. The placeholder is the
-- snapshot's name as a quoted literal: SET takes no parameters.
SET TRANSACTION SNAPSHOT {{snapshot}}
