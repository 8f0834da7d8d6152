"""An MCP server (the official ``mcp`` SDK): the memory tools agents call, over streamable HTTP at ``/mcp``
(``http.py``, mounted by mnesio_site/asgi.py) and over stdio (``manage.py mcp``).

``tools.py`` holds what each tool does, through the same services and selectors the API's views call, for the user
the request authenticated as (API tokens and their scope limits, as on /api/ and /v1/); ``server.py`` declares the
tools (names, descriptions, JSON schemas) and turns the API's errors into MCP tool errors carrying its stable codes.
"""
