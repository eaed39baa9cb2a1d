"""A reply's token alternatives in the store: packed and read back (float16 logprobs), kept
apart from the message row, deleted with the message, a damaged row read as none, and a
version 6 file migrated with its rows kept."""

from __future__ import annotations

import math

from localpaged.ui.store import Store, TokenChoice
from localpaged.ui.store.alternatives import pack, unpack
from localpaged.ui.store.schema import SCHEMA_VERSION

CHOICES = [TokenChoice(17, -0.25, ((17, -0.25), (4, -1.5), (900, -3.0))),
           TokenChoice(5, -2.0, ((3, -0.5), (5, -2.0))),                 # fewer kept here
           TokenChoice(8, -math.inf, ())]


def test_pack_and_unpack():
    back = unpack(pack(CHOICES))
    assert [c.token_id for c in back] == [17, 5, 8]
    assert back[0].top == ((17, -0.25), (4, -1.5), (900, -3.0))       # exact in float16
    assert back[1].top == ((3, -0.5), (5, -2.0)) and back[2].top == ()
    assert back[1].logprob == -2.0 and back[2].logprob == -math.inf
    assert unpack(pack([])) == []


def test_kept_per_reply_and_deleted_with_it(tmp_path):
    with Store(tmp_path / "c.db") as s:
        cid = s.create_conversation().id
        user = s.add_message(cid, None, "user", "hi")
        reply = s.add_message(cid, user.id, "assistant", "hello")
        assert s.alternatives(reply.id) == []
        s.set_alternatives(reply.id, CHOICES)
        assert [c.token_id for c in s.alternatives(reply.id)] == [17, 5, 8]
        s.set_alternatives(reply.id, CHOICES[:1])                        # replaced
        assert len(s.alternatives(reply.id)) == 1
        s.db.execute("UPDATE token_alternatives SET data = ? WHERE message_id = ?",
                     [b"\x03\x09\x00\x00\x00junk", reply.id])
        assert s.alternatives(reply.id) == []                           # damaged: none
        s.set_alternatives(reply.id, CHOICES)
        s.delete_message(user.id)
        assert s.db.execute("SELECT count(*) FROM token_alternatives").fetchone()[0] == 0


def test_migration_from_version_6_keeps_rows(tmp_path):
    from helpers.store_versions import old_store
    conn = old_store(tmp_path / "v6.db", 6, rows=True)
    conn.commit()
    conn.close()
    with Store(tmp_path / "v6.db") as s:
        assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 7
        conv = s.list_conversations()[0]
        reply = s.active_path(conv.id)[-1]
        assert s.alternatives(reply.id) == []
        s.set_alternatives(reply.id, CHOICES)
        assert len(s.alternatives(reply.id)) == 3
