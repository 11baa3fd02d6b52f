"""``python -m trimq.demo``: the orderly takeover demo (``make demo``)."""

from trimq.demo.orderly_takeover import main

main()
