"""The job scheduler's logic and daemon: CASSINI's circles, compatibility scores and time
shifts (``scheduler.cassini``). Runs beside a tenant's jobs and imports nothing of the lab."""
