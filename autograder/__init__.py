"""The course's grader: `course check`, `course grade`, `course doctor`, `course sync`, `course nbgrader`."""
