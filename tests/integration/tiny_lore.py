"""A plugins folder for tests that load LoreMaster but do not test its lore.

LoreMaster pins every character's lore in the prefix cache when it loads;
with the shipped sample pack (samples/lore/emberfall.json, about 1,800
tokens of prefill) that dominates a sanitizer build's start-up. Suites that
only need *some* characters (HTTP character chat, remote routing, the
G-Assist bridge, the screen plugin's registry) use this copy instead: the
same plugins, but LoreMaster reads tests/data/lore/tiny.json (the same
character ids, a few sentences each). tests/integration/test_loremaster.py
keeps the shipped pack: it tests that pack."""
import shutil
from pathlib import Path

TINY_PACK = Path(__file__).resolve().parent.parent / "data" / "lore" / "tiny.json"


def plugins_with_tiny_lore(src, dest, only=None):
    """Fills DEST with the plugin folders of SRC (symlinked, or just the ones
    named in ONLY), LoreMaster's copied with its lore/ replaced by the tiny
    pack. Returns DEST."""
    src, dest = Path(src), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        if not (p / "manifest.json").exists() or (only and p.name not in only):
            continue
        if p.name != "loremaster":
            (dest / p.name).symlink_to(p.resolve(), target_is_directory=True)
            continue
        lm = dest / "loremaster"
        shutil.copytree(p, lm, symlinks=True)
        shutil.rmtree(lm / "lore")
        (lm / "lore").mkdir()
        shutil.copy(TINY_PACK, lm / "lore" / "tiny.json")
    return dest
