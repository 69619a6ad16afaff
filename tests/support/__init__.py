"""Helpers shared by the tests (not tests themselves): RNN cases, oracles, test-only engines, cuDNN header
parsing and skip markers, worker scripts for multi-process tests."""
