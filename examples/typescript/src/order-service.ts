// An order service's use of holdfast, in TypeScript (@grpc/grpc-js): the fragment a shop
// writes. An order holds a seat for ten minutes (Reserve), the customer pays (a card capture,
// here the reference `payments` participant's Charge), and the order is confirmed with that
// payment (Confirm). If the customer never pays, the coordinator expires the hold on its own;
// the service learns of it from the event feed (tcc.v1.Events Subscribe), resuming after the
// last sequence it handled, and closes the order.

import * as grpc from "@grpc/grpc-js";
import { call, client } from "./tcc";

export const HOLD_FOR_SECONDS = 600;

/** The fields of a tcc.v1.Reservation this service reads. */
export interface Reservation {
  id: string;
  state: string; // "HELD", "CONFIRMED", "EXPIRED", ...
  hold_token: string;
  payments: { participant: string; payment_ref: string; amount_minor: number; currency: string; state: string }[];
}

/** The fields of a tcc.v1.Event this service reads. */
export interface Event {
  sequence: number;
  type: string; // "RESERVATION_EXPIRED", "HEARTBEAT", ...
  reservation: Reservation | null;
}

export interface Order {
  orderId: string;
  customer: string;
  seat: string;
  reservationId: string;
  holdToken: string;
  /** HELD -> PAID, or HELD -> EXPIRED (the hold ran out before a payment). */
  status: string;
  paymentRef: string;
}

export class OrderService {
  readonly holdfast: grpc.Client;
  private readonly events: grpc.Client;
  private readonly payments: grpc.Client;
  readonly orders = new Map<string, Order>();
  /** The last event sequence handled: where the feed resumes (kept durably in real life). */
  cursor = 0;

  /** `shop` labels every reservation this service makes, so its feed carries only those. */
  constructor(coordinator: string, payments: string, private readonly shop: string) {
    this.holdfast = client("Coordinator", coordinator);
    this.events = client("Events", coordinator);
    this.payments = client("Payments", payments);
  }

  /** Holds the seat for ten minutes. The order id is the Reserve's request id, so a retried
   * place() after a timeout returns the same reservation instead of a second one. */
  async place(orderId: string, customer: string, seat: string): Promise<Order> {
    const reservation = await call<Reservation>(this.holdfast, "Reserve", {
      request_id: orderId,
      holder: customer,
      ttl: { seconds: HOLD_FOR_SECONDS },
      holds: [{ participant: "seats", resource: seat, quantity: 1 }],
      labels: { shop: this.shop, order: orderId },
    });
    const order: Order = {
      orderId,
      customer,
      seat,
      reservationId: reservation.id,
      holdToken: reservation.hold_token, // only Reserve's answer carries it
      status: reservation.state,
      paymentRef: "",
    };
    this.orders.set(orderId, order);
    return order;
  }

  /** Captures the payment, then confirms the order with it: the coordinator records the
   * payment and confirms the seat, or refunds it if the hold can no longer be had. */
  async pay(orderId: string, account: string, amountMinor: number, currency: string): Promise<Reservation> {
    const order = this.orders.get(orderId);
    if (!order) {
      throw new Error(`no order ${orderId}`);
    }
    const charged = await call<{ payment_ref: string }>(this.payments, "Charge", {
      account,
      amount_minor: amountMinor,
      currency,
      reservation_id: order.reservationId,
    });
    const confirmed = await call<Reservation>(this.holdfast, "Confirm", {
      reservation_id: order.reservationId,
      hold_token: order.holdToken,
      payment: { participant: "payments", payment_ref: charged.payment_ref, amount_minor: amountMinor, currency },
    });
    order.paymentRef = charged.payment_ref;
    if (confirmed.state === "CONFIRMED") {
      order.status = "PAID";
    }
    return confirmed;
  }

  /** What the service does with one event of its reservations. */
  onEvent(event: Event): void {
    const order = [...this.orders.values()].find((o) => o.reservationId === event.reservation?.id);
    if (!order) {
      return;
    }
    if (event.type === "RESERVATION_EXPIRED") {
      order.status = "EXPIRED"; // release the cart, e-mail the customer, ...
    } else if (event.type === "RESERVATION_CONFIRMED") {
      order.status = "PAID";
    }
  }

  /** Reads the feed after `cursor` (the backlog, then live), handling each event, until
   * `done()` holds; rejects if it does not within `timeoutMs`. */
  followEvents(done: () => boolean, timeoutMs = 30_000): Promise<void> {
    const deadline = new Date(Date.now() + timeoutMs);
    const request = { after_sequence: this.cursor, filter: { labels: { shop: this.shop } } };
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    const stream: grpc.ClientReadableStream<Event> = (this.events as any).Subscribe(request, { deadline });
    return new Promise((resolve, reject) => {
      let finished = false;
      stream.on("data", (event: Event) => {
        this.cursor = Math.max(this.cursor, event.sequence);
        if (event.type !== "HEARTBEAT") {
          this.onEvent(event);
        }
        if (!finished && done()) {
          finished = true;
          stream.cancel();
          resolve();
        }
      });
      stream.on("error", (error: grpc.ServiceError) => {
        if (finished) {
          return; // the CANCELLED of our own cancel()
        }
        finished = true;
        reject(
          error.code === grpc.status.DEADLINE_EXCEEDED
            ? new Error(`the events awaited did not arrive within ${timeoutMs} ms`)
            : error,
        );
      });
      stream.on("end", () => {
        if (!finished) {
          finished = true;
          reject(new Error("the event feed ended before the events awaited arrived"));
        }
      });
    });
  }

  async latestSequence(): Promise<number> {
    const answer = await call<{ sequence: number }>(this.events, "GetLatestSequence", {});
    return answer.sequence;
  }

  close(): void {
    for (const c of [this.holdfast, this.events, this.payments]) {
      c.close();
    }
  }
}
