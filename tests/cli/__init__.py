"""End-to-end and unit tests of the abeja CLI (package: keeps its conftest apart)."""
