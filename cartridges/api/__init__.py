"""The cartridge, question, configuration and metrics endpoints of the DRF API (mounted at /api/)."""
