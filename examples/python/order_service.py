"""An order service's use of holdfast, in Python (grpcio): the fragment a shop writes.

An order holds a seat for ten minutes (Reserve), the customer pays (a card capture, here the
reference `payments` participant's Charge), and the order is confirmed with that payment
(Confirm). If the customer never pays, the coordinator expires the hold on its own; the
service learns of it from the event feed (tcc.v1.Events Subscribe), resuming after the last
sequence it handled, and closes the order.
"""

import dataclasses
from typing import Callable, Dict

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from tcc_stubs import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    events_pb2,
    events_pb2_grpc,
    payments_pb2,
    payments_pb2_grpc,
)

Reservation = coordinator_pb2.Reservation
Event = events_pb2.Event

HOLD_FOR_SECONDS = 600


@dataclasses.dataclass
class Order:
    order_id: str
    customer: str
    seat: str
    reservation_id: str = ""
    hold_token: str = ""
    # PLACED -> HELD -> PAID, or HELD -> EXPIRED (the hold ran out before a payment).
    status: str = "PLACED"
    payment_ref: str = ""


class OrderService:
    """Orders, each backed by one reservation at the coordinator.

    `shop` labels every reservation this service makes, so its event feed carries only its
    own reservations' events.
    """

    def __init__(self, coordinator: grpc.Channel, payments: grpc.Channel, shop: str):
        self.holdfast = coordinator_pb2_grpc.CoordinatorStub(coordinator)
        self.events = events_pb2_grpc.EventsStub(coordinator)
        self.payments = payments_pb2_grpc.PaymentsStub(payments)
        self.shop = shop
        self.orders: Dict[str, Order] = {}
        # The last event sequence handled: where the feed resumes (kept durably in real life).
        self.cursor = 0

    def place(self, order_id: str, customer: str, seat: str) -> Order:
        """Holds the seat for ten minutes. The order id is the Reserve's request id, so a
        retried place() after a timeout returns the same reservation instead of a second one."""
        order = Order(order_id, customer, seat)
        reservation = self.holdfast.Reserve(
            coordinator_pb2.ReserveRequest(
                request_id=order_id,
                holder=customer,
                ttl=duration_pb2.Duration(seconds=HOLD_FOR_SECONDS),
                holds=[common_pb2.Hold(participant="seats", resource=seat, quantity=1)],
                labels={"shop": self.shop, "order": order_id},
            ),
            timeout=10,
        )
        order.reservation_id = reservation.id
        order.hold_token = reservation.hold_token  # only Reserve's answer carries it
        order.status = Reservation.State.Name(reservation.state)
        self.orders[order_id] = order
        return order

    def pay(self, order_id: str, account: str, amount_minor: int, currency: str) -> Reservation:
        """Captures the payment, then confirms the order with it: the coordinator records the
        payment and confirms the seat, or refunds the payment if the hold can no longer be had."""
        order = self.orders[order_id]
        charged = self.payments.Charge(
            payments_pb2.ChargeRequest(
                account=account,
                amount_minor=amount_minor,
                currency=currency,
                reservation_id=order.reservation_id,
            ),
            timeout=10,
        )
        payment = coordinator_pb2.Payment(
            participant="payments",
            payment_ref=charged.payment_ref,
            amount_minor=amount_minor,
            currency=currency,
        )
        confirmed = self.holdfast.Confirm(
            coordinator_pb2.ConfirmRequest(
                reservation_id=order.reservation_id,
                hold_token=order.hold_token,
                payment=payment,
            ),
            timeout=10,
        )
        order.payment_ref = charged.payment_ref
        if confirmed.state == Reservation.CONFIRMED:
            order.status = "PAID"
        return confirmed

    def on_event(self, event) -> None:
        """What the service does with one event of its reservations."""
        order = next(
            (o for o in self.orders.values() if o.reservation_id == event.reservation.id), None
        )
        if order is None:
            return
        if event.type == Event.RESERVATION_EXPIRED:
            order.status = "EXPIRED"  # release the cart, e-mail the customer, ...
        elif event.type == Event.RESERVATION_CONFIRMED:
            order.status = "PAID"

    def follow_events(self, done: Callable[[], bool], timeout: float = 30.0) -> None:
        """Reads the feed after `self.cursor` (the backlog, then live), handling each event,
        until `done()` holds; raises TimeoutError if it does not within `timeout` seconds."""
        request = events_pb2.SubscribeRequest(
            after_sequence=self.cursor,
            filter=events_pb2.EventFilter(labels={"shop": self.shop}),
        )
        stream = self.events.Subscribe(request, timeout=timeout)
        try:
            for event in stream:
                self.cursor = max(self.cursor, event.sequence)
                if event.type != Event.HEARTBEAT:
                    self.on_event(event)
                if done():
                    return
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        finally:
            stream.cancel()
        raise TimeoutError(f"the events awaited did not arrive within {timeout} s")

    def latest_sequence(self) -> int:
        return self.events.GetLatestSequence(events_pb2.GetLatestSequenceRequest()).sequence


def reason_of(error: grpc.RpcError) -> str:
    """The reason of a refusal (`HOLD_EXPIRED`, `INSUFFICIENT_CAPACITY`, ...): the
    google.rpc.ErrorInfo (domain tcc.v1) in the status details; "" if there is none."""
    status = rpc_status.from_call(error)
    for detail in status.details if status else []:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info) and info.domain == "tcc.v1":
            return info.reason
    return ""
