"""What several test modules share: reference recipes, tiny models, live servers, stub backends.

The one home of shared test code: a test module imports from here and never from another test module
(tests/test_suite_layout.py checks both).
"""
