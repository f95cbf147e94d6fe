"""HTTP: the application, its middleware, the handlers and the streams (SSE, Socket.IO)."""
