"""HTTP plumbing shared by both APIs: the middleware and error handlers, body reading, framing, JSON,
connections, the API key.

Nothing here knows the decision engine or the routes: the error handlers know each API's error shape
(``decisions.errors``, ``systemone.errors``), and the middleware hands a request's deadline to the engine
through ``request_scope``.
"""
