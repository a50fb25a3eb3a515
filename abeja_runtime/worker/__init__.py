"""The handler side: what runs in a handler process (:mod:`.process`), and nothing of HTTP
serving; it never imports aiohttp."""
