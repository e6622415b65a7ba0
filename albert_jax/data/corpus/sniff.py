"""What a file's first bytes hold, whatever its name says: the one place that knows magic numbers
and byte-order marks (the corpus readers check every input file with it before reading it).

`container(head)` names a compressed or binary container from the file's own first bytes;
`text_encoding(head)` names an encoding other than UTF-8 that the (decompressed) text is in;
`strip_bom` drops a UTF-8 byte-order mark, which every text format accepts silently.
"""

from __future__ import annotations

HEAD_BYTES = 1 << 16  # how much of a file (of its decompressed text) is looked at

UTF8_BOM = b"\xef\xbb\xbf"

# Magic numbers at a file's start -> (what it is, the codec (formats.CODECS) or the
# data.input_format that reads it, or None).
_MAGIC = (
  (b"\x1f\x8b", "gzip data", "gzip"),
  (b"\x28\xb5\x2f\xfd", "zstandard data", "zstd"),
  (b"BZh", "bzip2 data", "bz2"),
  (b"\xfd7zXZ\x00", "xz data", "xz"),
  (b"PAR1", "a Parquet file", "parquet"),
  (b"ARROW1", "an Arrow IPC file", "arrow"),
  (b"PK\x03\x04", "a ZIP archive", None),
  (b"\x04\x22\x4d\x18", "LZ4 data", None),
  (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", None),
  (b"SQLite format 3\x00", "an SQLite database", None),
  (b"%PDF-", "a PDF document", None),
)
# Byte-order marks of encodings the readers do not read (UTF-32's before UTF-16's: they share a
# prefix).
_BOMS = (
  (b"\xff\xfe\x00\x00", "UTF-32 LE"),
  (b"\x00\x00\xfe\xff", "UTF-32 BE"),
  (b"\xff\xfe", "UTF-16 LE"),
  (b"\xfe\xff", "UTF-16 BE"),
)


def container(head: bytes) -> tuple[str, str | None] | None:
  """(what the bytes are, their codec or the input format that reads them, or None) for a
  compressed or binary file's first bytes; None for anything else (text, or a type not known
  here)."""
  for magic, what, codec in _MAGIC:
    if head.startswith(magic):
      if codec == "bz2" and not head[3:4].isdigit():  # BZh then the block size 1-9
        continue
      return what, codec
  return None


# Text is binary when more than one byte in STRAY_NULS of its first bytes is NUL; fewer are a few
# damaged lines among real ones (web extractions have them), which the readers skip and count.
STRAY_NULS = 1000


def text_encoding(head: bytes) -> str | None:
  """What text starting with `head` holds when it is not UTF-8 ("UTF-16 LE text (byte-order
  mark), not UTF-8", ...): a UTF-16 or UTF-32 byte-order mark or, without one, NUL bytes (UTF-8
  text never holds them: UTF-16 without a mark, or binary data; a stray few, STRAY_NULS, are
  damaged lines); None for UTF-8 (a UTF-8 mark included)."""
  for bom, name in _BOMS:
    if head.startswith(bom):
      return f"{name} text (byte-order mark), not UTF-8"
  nuls = head.count(b"\x00")
  if not nuls:
    return None
  # UTF-16 without a mark: a NUL beside each ASCII character, all on one side of the pairs.
  even, odd = head[0::2].count(b"\x00"), head[1::2].count(b"\x00")
  if nuls >= 8 and odd > 9 * even:
    return "UTF-16 LE text (no byte-order mark), not UTF-8"
  if nuls >= 8 and even > 9 * odd:
    return "UTF-16 BE text (no byte-order mark), not UTF-8"
  if nuls * STRAY_NULS <= len(head):
    return None  # text with a few stray NULs (a web extraction's damage): its lines are read
  return f"NUL bytes ({nuls:,} in the first {len(head):,}: binary data?), not UTF-8 text"


def strip_bom(line: bytes) -> bytes:
  return line[len(UTF8_BOM) :] if line.startswith(UTF8_BOM) else line
