-- Put the selected dead-lettered rows back in line with a fresh attempt budget.
UPDATE {{schema}}.outbox
SET dead_lettered_at = NULL,
    attempts         = 0,
    next_attempt_at  = NULL
WHERE {{dead_letter_filter}}
RETURNING seq
