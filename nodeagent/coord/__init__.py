"""Everything that talks to Redis. No other package imports redis."""
