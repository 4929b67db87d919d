"""Deployment Engine helpers: credentials for TLS and SuperNode authentication (see README)."""
