"""Images attached to user messages in the store: read and checked from a file's bytes (kinds,
caps, truncated and mislabelled files refused by name), kept once per sha256 with the message
that names them, deleted with the last message naming them, carried by the JSON export once
each (base64) and restored byte for byte by an import, whose images are checked whole first;
and a version 7 file migrated with its rows kept."""

from __future__ import annotations

import base64
import copy
import hashlib
import io

import pytest
from PIL import Image

from localpaged.ui.store import Store
from localpaged.ui.store.images import MAX_IMAGE_BYTES, decode, read_image
from localpaged.ui.store.schema import SCHEMA_VERSION


def png(color=(200, 30, 30), size=(24, 16), fmt="PNG", **save) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt, **save)
    return buf.getvalue()


def rows(s: Store) -> int:
    return s.image_count()


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "c.db") as s:
        yield s


def test_read_image_kinds_and_sizes():
    for fmt, mime in (("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")):
        im = read_image(png(fmt=fmt), f"a.{fmt.lower()}")
        assert (im.mime, im.width, im.height) == (mime, 24, 16)
        assert im.sha256 == hashlib.sha256(im.data).hexdigest()
    frames = [Image.new("RGB", (10, 8), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    gif = read_image(buf.getvalue(), "anim.gif")
    assert gif.mime == "image/gif"
    assert decode(gif.data).getpixel((0, 0)) == (255, 0, 0)        # the first frame


def test_bad_images_are_refused_by_name(tmp_path):
    data = png(size=(64, 64))
    with pytest.raises(ValueError, match="cut.png could not be read as an image"):
        read_image(data[: len(data) // 2], "cut.png")                # truncated
    with pytest.raises(ValueError, match="notes.png is not an image"):
        read_image(b"just some text, not a picture\n" * 10, "notes.png")
    buf = io.BytesIO()
    Image.new("1", (8000, 6000)).save(buf, format="PNG")             # 48 M pixels, small file
    with pytest.raises(ValueError, match=r"huge.png is 8000x6000 pixels; .* at most 40,000,000"):
        read_image(buf.getvalue(), "huge.png")
    with pytest.raises(ValueError, match="big.png is .* bytes; an image may have at most"):
        read_image(b"\x89PNG\r\n\x1a\n" + bytes(MAX_IMAGE_BYTES), "big.png")
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="BMP")
    with pytest.raises(ValueError, match="pic.bmp is a BMP image; PNG, JPEG, WebP or GIF"):
        read_image(buf.getvalue(), "pic.bmp")


def test_kept_once_and_deleted_with_the_last_message_naming_it(store):
    red, blue = read_image(png(), "red.png"), read_image(png((0, 0, 255)), "blue.png")
    cid = store.create_conversation().id
    a = store.add_message(cid, None, "user", "look", images=[red])
    b = store.add_message(cid, a.id, "user", "again", images=[read_image(red.data, "copy.png"),
                                                              blue])
    assert rows(store) == 2                                         # red once
    assert [r["name"] for r in b.extra["images"]] == ["copy.png", "blue.png"]
    assert a.extra["images"] == [red.ref()]
    assert store.image(red.sha256).data == red.data and store.image("0" * 64) is None
    store.delete_message(b.id)
    assert rows(store) == 1 and store.image(blue.sha256) is None     # blue: nobody names it
    forked = store.fork_conversation(a.id)                          # names red too
    store.delete_conversation(cid)
    assert store.image(red.sha256) is not None
    store.delete_conversation(forked.id)
    assert rows(store) == 0
    with pytest.raises(ValueError, match="only a user message carries images"):
        store.add_message(store.create_conversation().id, None, "assistant", "x", images=[red])
    assert rows(store) == 0


def test_a_bad_extra_row_does_not_stop_deletes(store):
    red = read_image(png(), "red.png")
    cid = store.create_conversation().id
    m = store.add_message(cid, None, "user", "x", images=[red])
    x = store.add_message(cid, m.id, "user", "x")
    y = store.add_message(cid, x.id, "user", "y")
    store.db.execute("UPDATE messages SET extra = 'not json' WHERE id = ?", [x.id])
    store.db.execute("UPDATE messages SET extra = ? WHERE id = ?",
                     ['{"images": ["a string", 3, {"sha256": 5}]}', y.id])
    store.delete_message(y.id)
    assert store.image(red.sha256) is not None
    store.delete_message(m.id)
    assert rows(store) == 0


def test_export_import_round_trip_is_byte_equal(tmp_path, store):
    red, blue = read_image(png(), "red.png"), read_image(png((0, 0, 255), fmt="WEBP"), "b.webp")
    cid = store.create_conversation("pics").id
    a = store.add_message(cid, None, "user", "one", images=[red, blue])
    r = store.add_message(cid, a.id, "assistant", "nice")
    store.add_message(cid, r.id, "user", "two", images=[red])
    data = store.export_json(cid)
    assert sorted(data["images"]) == sorted([red.sha256, blue.sha256])   # once each
    assert base64.b64decode(data["images"][red.sha256]["data"]) == red.data
    assert "*Image:* red.png" in store.export_markdown(cid)
    with Store(tmp_path / "other.db") as other:
        new = other.import_json(copy.deepcopy(data))
        msgs = other.messages(new.id)
        assert [m.extra.get("images") for m in msgs] == [m["extra"].get("images")
                                                         for m in data["messages"]]
        for im in (red, blue):
            assert other.image(im.sha256).data == im.data
        assert other.image_count() == 2
    again = store.import_json(copy.deepcopy(data))                  # same store: shared rows
    assert rows(store) == 2
    store.delete_conversation(cid)
    assert store.image(blue.sha256).data == blue.data
    store.delete_conversation(again.id)
    assert rows(store) == 0


def bad(data, change):
    data = copy.deepcopy(data)
    change(data)
    return data


def test_a_bad_image_in_an_import_is_refused_whole(store):
    red = read_image(png(), "red.png")
    cid = store.create_conversation().id
    store.add_message(cid, None, "user", "one", images=[red])
    good = store.export_json(cid)
    key = red.sha256
    text = base64.b64encode(b"hello, not an image").decode()
    cases = [
        (lambda d: d["images"].update({"XYZ": d["images"].pop(key)}), "images\\['XYZ'\\]: .*sha256"),
        (lambda d: d["images"][key].update(data="***"), "data: not base64"),
        (lambda d: d["images"][key].update(data=base64.b64encode(png((1, 2, 3))).decode()),
         "its bytes' sha256 is not its key"),
        (lambda d: d["images"].update({hashlib.sha256(b"hello, not an image").hexdigest():
                                       {"data": text}}), "is not an image"),
        (lambda d: d["images"].clear(), r"messages\[0\].extra.images\[0\].sha256: no image"),
        (lambda d: d["messages"][0]["extra"].update(images="red.png"), "extra.images"),
        (lambda d: d["messages"][0].update(role="assistant"), "extra.images: a user message"),
    ]
    before = store.export_json(cid)
    for change, error in cases:
        with pytest.raises(ValueError, match=error):
            store.import_json(bad(good, change))
    assert len(store.list_conversations()) == 1 and rows(store) == 1
    assert store.export_json(cid) == before
    unused = bad(good, lambda d: d["images"].update(
        {read_image(png((9, 9, 9)), "x").sha256: {"data": base64.b64encode(png((9, 9, 9))).decode()}}))
    store.import_json(unused)
    assert rows(store) == 1                     # an image no message names is not kept


def test_migration_from_version_7_keeps_rows(tmp_path):
    from helpers.store_versions import old_store
    conn = old_store(tmp_path / "v7.db", 7, rows=True)
    conn.commit()
    conn.close()
    with Store(tmp_path / "v7.db") as s:
        assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 8
        conv = s.list_conversations()[0]
        assert [m.content for m in s.active_path(conv.id)] == ["hi", "hello"]
        assert rows(s) == 0
        m = s.add_message(conv.id, s.active_path(conv.id)[-1].id, "user", "see",
                          images=[read_image(png(), "p.png")])
        assert s.image(m.extra["images"][0]["sha256"]) is not None
