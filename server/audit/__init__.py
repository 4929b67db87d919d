"""Judging what was forgotten: the membership-inference audit and the judge."""
