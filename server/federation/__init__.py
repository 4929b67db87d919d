"""The federation the ServerApp talks to: its members, the queries and replies, the screening of replies, metering and threads."""
