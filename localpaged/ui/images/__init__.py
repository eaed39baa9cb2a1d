"""A user message's images: their chat message parts, thumbnails and the route serving them."""
