// An upstream OpenID provider for the authorization server's tests: the `oidc-provider`
// package (npm), with one confidential client (Wharf) and its development sign-in pages, on
// which any login and password sign in as that login.
//
//   node oidc_provider.mjs MODULE_DIR PORT CLIENT_ID CLIENT_SECRET REDIRECT_URI
//
// MODULE_DIR is where `npm install oidc-provider` put it (scripts/test.sh installs it into
// target/node-oidc/node_modules/oidc-provider). Prints "READY <issuer>" once it listens.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const [moduleDir, port, clientId, clientSecret, redirectUri] = process.argv.slice(2);
const entry = createRequire(`${moduleDir}/`).resolve(moduleDir);
const { default: Provider } = await import(pathToFileURL(entry).href);

const issuer = `http://127.0.0.1:${port}`;
const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: [redirectUri],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  pkce: { required: () => true },
  findAccount: async (_ctx, id) => ({ accountId: id, claims: async () => ({ sub: id }) }),
  cookies: { keys: ['wharf-test-cookie-key'] },
});
provider.listen(Number(port), '127.0.0.1', () => console.log(`READY ${issuer}`));
