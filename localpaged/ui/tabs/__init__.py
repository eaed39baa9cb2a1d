"""The page's chat tabs: which conversation each tab shows, which is current, opening, closing
and restoring them (across reloads and restarts)."""
