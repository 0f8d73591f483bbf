"""``distcomm bench``: time distcomm's collectives (and, with ``--compare raw``, the engine's own
calls on the same buffers) at many sizes, under any launcher. ``options`` parses what the user
asks for, ``operations`` holds each operation's buffers and call, ``runner`` times
them, ``report`` prints, ``plot`` draws the JSON. Private: the command is the interface
(docs/bench.md)."""
