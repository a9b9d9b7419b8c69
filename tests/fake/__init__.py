"""A tiny fake lesson ("toy") used to test the grader's machinery apart from any real lesson."""
