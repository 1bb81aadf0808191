-- The database the relay's pool connects to, which its slot must read.
SELECT current_database()
