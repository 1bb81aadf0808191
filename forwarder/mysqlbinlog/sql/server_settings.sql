-- What the relay needs of the server, read at start.
SELECT @@GLOBAL.log_bin, @@GLOBAL.binlog_format, @@GLOBAL.binlog_row_image, @@GLOBAL.server_id, VERSION(), CURRENT_USER()
