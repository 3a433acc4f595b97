"""The MCP Python SDK's own OAuth client (mcp 2.3.0), pointed at a Wharf server.

    python sdk_oauth_client.py MCP_URL REDIRECT_URI [--client-metadata-url URL] TOOL ARGS_JSON

It connects statelessly (2026-07-28); the first request meets a 401, and the SDK runs its
OAuth flow: protected resource metadata, authorization server metadata, a Client ID Metadata
Document client id when one is given (else Dynamic Client Registration), authorization code
with PKCE. The person's part is played by the Rust test that starts this script:

    stdout  AUTHORIZE <url>      the URL to open in a browser
    stdin   <callback URL>       where the browser landed, with code, state and iss
    stdout  TOOLS <json>         tools/list, then
    stdout  RESULT <json>        the tool's result
    stdout  FAILED <error>       instead, on any failure (exit status 1)
"""

import argparse
import json
import sys
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
from mcp.client import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata


class MemoryStorage(TokenStorage):
    """Tokens and client registration, kept for the life of the process."""

    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


def say(tag, text):
    print(f"{tag} {text}", flush=True)


async def open_in_browser(url):
    say("AUTHORIZE", url)


async def wait_for_callback():
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    params = {k: v[0] for k, v in parse_qs(urlsplit(line.strip()).query).items()}
    if "error" in params:
        raise RuntimeError(f"authorization refused: {params['error']}: {params.get('error_description')}")
    return AuthorizationCodeResult(code=params["code"], state=params.get("state"), iss=params.get("iss"))


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("redirect_uri")
    parser.add_argument("tool")
    parser.add_argument("arguments")
    parser.add_argument("--client-metadata-url")
    args = parser.parse_args()

    provider = OAuthClientProvider(
        server_url=args.url,
        client_metadata=OAuthClientMetadata(
            client_name="Python SDK test client",
            redirect_uris=[args.redirect_uri],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=MemoryStorage(),
        redirect_handler=open_in_browser,
        callback_handler=wait_for_callback,
        client_metadata_url=args.client_metadata_url,
    )
    try:
        async with httpx2.AsyncClient(auth=provider, timeout=60) as http:
            async with Client(streamable_http_client(args.url, http_client=http), mode="2026-07-28") as client:
                tools = await client.list_tools()
                say("TOOLS", tools.model_dump_json(by_alias=True, exclude_none=True))
                result = await client.call_tool(args.tool, json.loads(args.arguments))
                say("RESULT", result.model_dump_json(by_alias=True, exclude_none=True))
    except BaseException as error:  # an ExceptionGroup from the SDK's task groups included
        say("FAILED", f"{type(error).__name__}: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
