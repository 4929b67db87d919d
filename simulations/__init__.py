"""Run configurations (TOML) of experiments, and the scripts that launch them and turn results into
tables and figures."""
