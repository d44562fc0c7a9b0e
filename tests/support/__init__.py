"""Support code for the tests: tiny models and multi-process workers."""
