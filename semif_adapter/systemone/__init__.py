"""Jev-compatible System One API (``/v1/systemone``, ``/v1/models``) on top of the decision engine.

``routes`` answers both paths (and, through ``routes.respond``, a System One body sent to
``/invocations``); ``service`` turns a decoded body into engine decisions and answers; ``protocol`` is
the wire schema; ``errors`` its error shape.
"""
