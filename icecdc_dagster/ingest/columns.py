"""The columns the coercion pass adds next to a table's own, shared by the native reader and the Python
rules (prefixed: a table may have a column "raw" or "reason"), and the op of a tombstone."""

REASON, RAW, SOURCE_FILE, SOURCE_OFFSET = ("_icecdc_reason", "_icecdc_raw", "_icecdc_source_file",
                                           "_icecdc_source_offset")
NOTES, WIDEN = "_icecdc_notes", "_icecdc_widen"
TOMBSTONE = "tombstone"
