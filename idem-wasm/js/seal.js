// Sealed records for every store (IDEM-SEAL-1): every record a store
// writes is encrypted with AES-256-GCM (WebCrypto) under the first of its keys, with the
// record's storage key authenticated beside it, in idem-core's sealed format, which the
// Rust stores read and write too. Any key of the list opens a record sealed with it
// (IDEM-SEAL-2); a record that none opens is refused (IDEM-SEAL-3) and never executed.
import { sealAad, sealCheckKeys, sealFrame, sealHead, sealedParts } from "./idem_wasm.js";

/** Thrown by a store for a sealed record it cannot open: its key is not on the store's
 * list, or it was moved from another storage key, or damaged. Answered 500 record-sealed. */
function unopened(message) {
  const e = new Error(message);
  e.name = "SealedRecordError";
  e.code = "IDEM-SEAL-3";
  return e;
}

const ALGORITHM = "AES-GCM";
/** AES-GCM's nonce and tag, as WebCrypto takes and gives them (96 and 128 bits). */
const NONCE_BYTES = 12;
const TAG_BYTES = 16;

/**
 * The sealer of a store's `seal` option `{ keys: [{ id, key }, …], readClear }` (each key 32
 * bytes, a Uint8Array or ArrayBuffer, or an AES-256-GCM CryptoKey), or null without one.
 * Records in clear are refused (IDEM-SEAL-3) unless `readClear` is true, for the time a store
 * written in clear moves to sealing. Throws a RangeError (IDEM-JS-1) for keys that cannot be
 * used.
 */
export function recordSealer(option) {
  if (option === undefined) return null;
  const keys = option?.keys;
  if (!Array.isArray(keys)) {
    const e = new RangeError("options.seal must be { keys: [{ id, key }, …] }");
    e.code = "IDEM-JS-1";
    throw e;
  }
  const ids = keys.map((k) => (typeof k?.id === "string" ? k.id : ""));
  // A CryptoKey counts as 32 bytes only when it is an AES-256-GCM key.
  const lengths = keys.map((k) => (isCryptoKey(k?.key) ? (k.key.algorithm?.name === ALGORITHM ? k.key.algorithm.length / 8 : 0) : (k?.key?.byteLength ?? 0)));
  sealCheckKeys(ids, Uint32Array.from(lengths));
  // A CryptoKey must do what the store asks of it: seal with the first, open with each.
  keys.forEach((k, i) => {
    const usages = isCryptoKey(k.key) ? k.key.usages : null;
    if (usages !== null && !(usages.includes("decrypt") && (i > 0 || usages.includes("encrypt")))) {
      const e = new RangeError(`options.seal key ${JSON.stringify(ids[i])} must allow ${i === 0 ? "encrypt and decrypt" : "decrypt"}`);
      e.code = "IDEM-JS-1";
      throw e;
    }
  });
  // The keys as they are now: bytes copied, so that a caller who clears or reuses its buffer
  // afterwards (as it should, once the store has them) changes nothing here.
  const material = keys.map(({ key }) =>
    isCryptoKey(key) ? key : new Uint8Array(ArrayBuffer.isView(key) ? key.buffer.slice(key.byteOffset, key.byteOffset + key.byteLength) : key.slice(0)),
  );
  const head = sealHead(ids[0]);
  const readClear = option.readClear === true;
  // Imported once, when first used: WebCrypto's import is asynchronous.
  const imported = new Map();
  const cryptoKey = (i) => {
    let k = imported.get(i);
    if (k === undefined) {
      const key = material[i];
      k = isCryptoKey(key) ? Promise.resolve(key) : crypto.subtle.importKey("raw", key, ALGORITHM, false, ["encrypt", "decrypt"]);
      imported.set(i, k);
    }
    return k;
  };
  return {
    /** How many bytes sealing adds to a record. */
    overhead: head.byteLength + NONCE_BYTES + TAG_BYTES,
    /** `bytes` (a record) sealed for `storageKey` with the first key. */
    async seal(storageKey, bytes) {
      const nonce = crypto.getRandomValues(new Uint8Array(NONCE_BYTES));
      const ciphertext = await crypto.subtle.encrypt({ name: ALGORITHM, iv: nonce, additionalData: sealAad(head, storageKey) }, await cryptoKey(0), bytes);
      return sealFrame(head, nonce, new Uint8Array(ciphertext));
    },
    /** The record of `bytes` read under `storageKey`, opened (or as it is, a record in
     * clear, with `readClear`). Rejects with code IDEM-SEAL-3 when it cannot be opened. */
    async open(storageKey, bytes) {
      let parts;
      try {
        parts = sealedParts(bytes, storageKey);
      } catch (err) {
        throw unopened(err.message);
      }
      if (parts === undefined) {
        if (readClear) return bytes;
        throw unopened("a record is stored in clear, and this store reads sealed records only");
      }
      try {
        const i = ids.indexOf(parts.keyId);
        if (i < 0) throw unopened(`a record is sealed with key ${JSON.stringify(parts.keyId)}, which this store does not hold`);
        const ciphertext = bytes.subarray(parts.ciphertextStart);
        try {
          const plain = await crypto.subtle.decrypt({ name: ALGORITHM, iv: parts.nonce, additionalData: parts.aad }, await cryptoKey(i), ciphertext);
          return new Uint8Array(plain);
        } catch {
          throw unopened("a sealed record does not open under its storage key (moved or damaged)");
        }
      } finally {
        parts.free();
      }
    },
  };
}

/** What `seal` (a sealer, or null) reads from `bytes` stored under `storageKey`: the record
 * opened, or in clear; a sealed record it cannot open rejects with code IDEM-SEAL-3. */
export async function openedRecord(seal, storageKey, bytes) {
  if (seal !== null) return seal.open(storageKey, bytes);
  return clearRecord(storageKey, bytes);
}

/** `bytes` stored under `storageKey` by a store without a seal: the record, in clear; a
 * sealed one throws with code IDEM-SEAL-3. */
export function clearRecord(storageKey, bytes) {
  const parts = sealedParts(bytes, storageKey);
  if (parts === undefined) return bytes;
  parts.free();
  throw unopened("a record is sealed, and this store holds no seal keys");
}

const isCryptoKey = (k) => typeof CryptoKey !== "undefined" && k instanceof CryptoKey;
