"""Gradio tab builders for the specdec app."""
