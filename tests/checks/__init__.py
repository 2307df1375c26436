"""The self-checks students run: messages, recorded expectations, plotting, each notebook's check machinery."""
