"""The pieces mnesio_site/settings.py builds its larger values with: the database, the blob storage, the API and
logging. Each reads its variables through ``core.settings_spec.read`` when called (never at import), so every run
of settings.py reads the environment afresh."""
