"""``handler`` exists but is not callable."""

handler = "model.bin"
