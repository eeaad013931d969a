"""Thin typer commands: parse, call one library function, write an artifact, print a table."""
