"""The reference answers: against PyTorch, the book's numbers, gradcheck, bad input."""
