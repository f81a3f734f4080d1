"""``python -m gpushare_hub.service``: run the gpushare hub service (see :mod:`.app`)."""

from .app import main

main()
