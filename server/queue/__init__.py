"""PostgreSQL as the queue: the pool, migrations, job SQL, admission, LISTEN and upkeep."""
