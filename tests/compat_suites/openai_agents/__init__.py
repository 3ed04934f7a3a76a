"""The OpenAI Agents SDK's own session tests, run against ``MemormSession`` on both engines.

See README.md in this folder: what was vendored from which SDK version and
file, and how it was adapted.
"""
