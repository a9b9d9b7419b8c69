"""One module of checks per lesson, named by the lesson's stem (l01_roofline.py, ...)."""
