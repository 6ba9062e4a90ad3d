// The server's REST API under {base_url}gpusession/api/, through Jupyter's own connection (its
// token and XSRF header). A refused answer becomes an ApiError carrying the server's message in
// words, which the panels show as they are.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export class ApiError extends Error {
  constructor(message: string, readonly status: number) {
    super(message);
  }
}

const settings = ServerConnection.makeSettings();

export async function api<T>(path: string, init: RequestInit = {}): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'gpusession/api', path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ApiError(`The Jupyter server did not answer (${String(error)}).`, 0);
  }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = body.message || `${response.status} ${response.statusText}`;
    throw new ApiError(message, response.status);
  }
  return body as T;
}

export const jsonBody = (value: unknown): RequestInit => ({
  body: JSON.stringify(value),
  headers: { 'Content-Type': 'application/json' }
});
