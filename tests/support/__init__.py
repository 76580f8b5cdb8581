"""Helpers the tests share: real processes and servers on loopback, the one bounded wait (`waiting.wait_for`),
HTTP calls, factories and pictures. No fixtures (those are in the conftest files) and no tests."""
