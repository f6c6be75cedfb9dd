"""Helpers shared by test files in several folders: tiny data, tiny experiments, child processes.

A test file imports what it shares from here (`from helpers.detection import ...`; tests/ is
on sys.path, see tests/conftest.py), never another test file's private functions.
"""
