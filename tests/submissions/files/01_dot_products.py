def dot(x, y):
    return sum(a * b for a, b in zip(x, y))
