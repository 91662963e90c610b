"""HTTP transport shared by both APIs: body reading, framing, JSON, deadlines, admission, connections, auth.

Nothing here knows the decision engine or the routes; the routers and ``serving`` import from here.
"""
