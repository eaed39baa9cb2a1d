"""The chat app's conversation store and the guard of its data directory. No UI, no engine.

  store.py          Store: conversations (create, list/search, rename, update, delete)
  tree.py           MessageTree: messages (add, update, delete, siblings, active path)
  export.py         ExportImport: fork, export to JSON / Markdown, import
  app_settings.py   AppSettings: app-wide settings (defaults for new chats), saved presets
  tool_servers.py   ToolServerRows: the MCP servers the user added
  alternatives.py   TokenAlternatives: each reply token's logprob and top alternatives
  images.py         StoredImages: images attached to user messages, content-addressed;
                    read_image: an image file read and checked (Pillow, caps)
  db.py             StoreBase: the connection, the lock, transactions
  errors.py         StoreError and its causes (disk full, read-only, locked, damaged, ...)
  private.py        owner-only modes for the data dir, the database, exports
  schema.py         the DDL, migrations, tree queries
  rows.py           Conversation, Message: rows read as safe values, whatever a row holds
  validate.py       the schema an import must meet (checked whole before anything is written)
  instance_lock.py  InstanceLock: one app per data directory (taken before the store opens)

The names below are what the rest of the app imports (`from localpaged.ui.store import Store`).
"""

from .store import (DB_FILENAME, EXPORT_FORMAT, ROLES, STATS_KEYS, STATUSES, Conversation, Message,
                    Store, StoreError, TokenChoice, ToolServer, default_data_dir)

__all__ = ["Conversation", "Message", "Store", "StoreError", "default_data_dir", "ROLES",
           "STATUSES", "STATS_KEYS", "DB_FILENAME", "EXPORT_FORMAT", "ToolServer", "TokenChoice"]
