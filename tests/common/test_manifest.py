"""The manifest and its canonical digest, exactly as protos/agent.proto defines them."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from common.manifest import Manifest, ManifestEntry, entries_from_proto, manifest_digest

CONFIG_SHA = hashlib.sha256(b'name: "m"\n').hexdigest()
MODEL_SHA = hashlib.sha256(b"print('hello')\n").hexdigest()


def test_a_known_manifest_has_the_digest_the_proto_defines() -> None:
    # Written in the order a directory walk might give; the digest is over path order.
    manifest = Manifest(
        (
            ManifestEntry("config.pbtxt", 10, CONFIG_SHA),
            ManifestEntry("1/model.py", 15, MODEL_SHA),
            ManifestEntry("1/empty", 0, hashlib.sha256(b"").hexdigest()),
        )
    )
    canonical = (
        b"1/empty\x000\x00e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
        + b"1/model.py\x0015\x00"
        + MODEL_SHA.encode()
        + b"\nconfig.pbtxt\x0010\x00"
        + CONFIG_SHA.encode()
        + b"\n"
    )
    assert manifest.digest == hashlib.sha256(canonical).hexdigest()
    assert [e.path for e in manifest.files] == ["1/empty", "1/model.py", "config.pbtxt"]
    assert manifest.total_bytes == 25


def test_the_digest_is_sha256_over_sorted_path_size_sha_lines() -> None:
    entries = [
        ManifestEntry("config.pbtxt", 12, "b" * 64),
        ManifestEntry("1/model.py", 300, "a" * 64),
    ]
    expected = hashlib.sha256(
        f"1/model.py\0{300}\0{'a' * 64}\nconfig.pbtxt\0{12}\0{'b' * 64}\n".encode()
    ).hexdigest()
    assert manifest_digest(entries) == expected
    assert manifest_digest(reversed(entries)) == expected


def test_the_proto_round_trip_keeps_every_entry() -> None:
    manifest = Manifest(
        (
            ManifestEntry("config.pbtxt", 10, CONFIG_SHA),
            ManifestEntry("1/model.py", 1 << 40, "0" * 64),
        )
    )
    message = manifest.to_proto()
    assert [(f.path, f.size, f.sha256) for f in message.files] == [
        ("1/model.py", 1 << 40, "0" * 64),
        ("config.pbtxt", 10, CONFIG_SHA),
    ]
    assert Manifest(tuple(entries_from_proto(message))) == manifest


_names = st.text(alphabet="abc/._-1", min_size=1, max_size=8)


@given(
    st.lists(
        st.tuples(_names, st.integers(0, 10**12), st.sampled_from(["0" * 64, "f" * 64])),
        min_size=1,
        max_size=6,
        unique_by=lambda t: t[0],
    ),
    st.data(),
)
def test_changing_any_field_of_any_entry_changes_the_digest(
    rows: list[tuple[str, int, str]], data: st.DataObject
) -> None:
    entries = [ManifestEntry(*row) for row in rows]
    index = data.draw(st.integers(0, len(entries) - 1))
    victim = entries[index]
    field = data.draw(st.sampled_from(["size", "sha256"]))
    if field == "size":
        changed = ManifestEntry(victim.path, victim.size + 1, victim.sha256)
    else:
        first = "1" if victim.sha256[0] != "1" else "2"
        changed = ManifestEntry(victim.path, victim.size, first + victim.sha256[1:])
    other = [*entries[:index], changed, *entries[index + 1 :]]
    assert manifest_digest(other) != manifest_digest(entries)
