"""File formats read and written for analysis: OTLP JSON lines, Parquet, Perfetto traces.
"""
