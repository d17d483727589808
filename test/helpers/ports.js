// Ports for the multi-process tests' jobs.
import * as net from 'node:net';

/** A loopback TCP port that was free a moment ago (for a multi-process job's store). */
export async function freePort() {
  const server = net.createServer();
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}
