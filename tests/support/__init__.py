"""Helpers of the tests: servers, child processes and byte builders that tests
import (``from support.s3_server import S3Server``) or run as scripts by path
(``tests/support/kill_writer.py``). None of them is a test."""
