// Headless Chromium for the browser tests: playwright-core driving the
// system Chromium (`CHROMIUM`, default /usr/bin/chromium) in a throwaway
// profile, with WebGPU on SwiftShader unless `webgpu: false`.
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

const BASE = ['--headless=new', '--no-sandbox', '--disable-quic', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--disable-default-apps', '--disable-extensions', '--no-default-browser-check'];
const WEBGPU = ['--enable-unsafe-webgpu', '--enable-features=Vulkan', '--use-vulkan=swiftshader',
  '--use-webgpu-adapter=swiftshader', '--use-angle=swiftshader'];

// Resolves to { browser, close() }; `context` adds Playwright context options.
export async function launchChromium({ webgpu = true, context = {} } = {}) {
  const profile = mkdtempSync(path.join(tmpdir(), 'blockdraft-chromium-'));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: webgpu ? [...BASE, ...WEBGPU] : BASE,
    ignoreDefaultArgs: ['--headless'],
    ...context,
  });
  const close = async () => {
    await browser.close();
    rmSync(profile, { recursive: true, force: true });
  };
  return { browser, close };
}
