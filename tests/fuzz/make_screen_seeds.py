#!/usr/bin/env python3
"""Writes the small seed corpus for fuzz_screen_decode into
corpus/screen_decode/ (PNG and JPEG files, each < 2 KB): RGB, grey,
palette, alpha, 16-bit and interlaced PNGs, baseline and progressive
JPEGs. The PNGs are built here with zlib; the JPEGs need Pillow (skipped
without it). Run from anywhere: python3 tests/fuzz/make_screen_seeds.py
"""
import io
import os
import struct
import zlib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "screen_decode")


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(w, h, ctype, depth, rows, extra=b"", interlace=0):
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, interlace)
    raw = b"".join(b"\0" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", zlib.compress(raw)) +
            chunk(b"IEND", b""))


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {
        "rgb.png": png(4, 3, 2, 8, [bytes(v for x in range(4) for v in (x * 60, y * 80, 90)) for y in range(3)]),
        "grey1.png": png(8, 2, 0, 1, [b"\xaa", b"\x55"]),
        "palette.png": png(2, 2, 3, 8, [b"\0\1", b"\1\0"],
                           extra=chunk(b"PLTE", b"\xff\0\0\0\xff\0") + chunk(b"tRNS", b"\x80")),
        "rgba16.png": png(2, 1, 6, 16, [bytes(range(16))]),
        "grey_alpha.png": png(2, 2, 4, 8, [b"\x10\xff\x20\x80", b"\x30\x00\x40\x40"]),
        "interlaced.png": None,
    }
    # Adam7: pass images of a 3x3 RGB picture (passes 1, 4, 6, 7 hold pixels)
    p1 = b"\0" + b"\x01\x02\x03"
    p4 = b"\0" + b"\x04\x05\x06"
    p6 = b"\0" + b"\x07\x08\x09" + b"\0" + b"\x0a\x0b\x0c"
    p7 = b"\0" + b"\x0d\x0e\x0f" * 3
    ihdr = struct.pack(">IIBBBBB", 3, 3, 8, 2, 0, 0, 1)
    seeds["interlaced.png"] = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
                               chunk(b"IDAT", zlib.compress(p1 + p4 + p6 + p7)) + chunk(b"IEND", b""))
    try:
        from PIL import Image
        img = Image.new("RGB", (16, 8))
        img.putdata([(x * 16, y * 32, (x ^ y) * 8) for y in range(8) for x in range(16)])
        for name, kw in (("baseline.jpg", {}), ("progressive.jpg", {"progressive": True}),
                         ("grey.jpg", {})):
            b = io.BytesIO()
            (img.convert("L") if name == "grey.jpg" else img).save(b, "JPEG", quality=80, **kw)
            seeds[name] = b.getvalue()
    except ImportError:
        pass
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
