def double(x):
    return 2 * x


def count(n):
    return n
