"""Brokers: the host side of capabilities.

A broker never sees a guest pointer. The engine adapter has already checked bounds, the gate
and the payload limit, and decoded the request with the entry's CBOR bounds; a broker validates
the request's *shape*, does the work, and answers a value or raises
:class:`~wasihost.status.HostStatus`.
"""
